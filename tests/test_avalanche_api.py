import numpy as np

from clbench.benchmarks import BENCHMARKS, build_benchmark


def test_learner_drives_a_strategy_from_avalanche_streams():
    from clbench.avalanche_api import Learner
    from clbench.benchmarks.streams import avalanche_image_benchmark

    learner = Learner("simplecil", backbone="vit_micro", weights="random")
    bench = build_benchmark(BENCHMARKS.get("emoji"), init_cls=18, increment=18)
    stream = avalanche_image_benchmark(bench, learner.eval_transform, learner.eval_transform)
    accs = []
    for exp in stream.train_stream:
        learner.train(exp)
        accs.append(learner.accuracy(stream.test_stream[: exp.current_experience + 1]))
    assert len(accs) == 2 and all(0 < a <= 100 for a in accs)
    # the same numbers as the harness path: SimpleCIL prototypes of the same features
    from clbench.harness import RunConfig, run

    import tempfile

    with tempfile.TemporaryDirectory() as d:
        rec = run(RunConfig(strategy="simplecil", backbone="vit_micro", weights="random", init_cls=18, increment=18,
                            out=d + "/r", save_features=False, batch_size=64))
    assert np.allclose(accs, rec["acc_curve"], atol=0.5)
