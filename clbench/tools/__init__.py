"""Maintenance commands that rebuild the data clbench embeds, run by hand (``python -m clbench.tools.NAME``), never
by a run: :mod:`clbench.tools.build_emoji` (``clbench/data/emoji.npz``) and :mod:`clbench.tools.build_emoji_domains`
(``clbench/data/emoji_domains.npz``). Nothing that ``clbench run`` or a report imports imports this package
(tests/test_architecture.py checks it); the benchmarks read the files these write.
"""
