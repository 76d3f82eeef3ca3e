"""clbench: class-incremental learning on frozen pre-trained Vision Transformers.

Importing the package is cheap on purpose (``clbench --help`` must answer in about a second): torch,
timm and Avalanche are imported only by the modules that need them.
"""

__version__ = "0.1.0"
