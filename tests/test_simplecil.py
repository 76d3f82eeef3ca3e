import torch

from clbench.methods.shared import class_means


def test_prototypes_equal_class_means(micro_session_factory):
    s = micro_session_factory("simplecil", init_cls=12, increment=12)
    for step in s.tasks():
        s.strategy.learn_task(step.task)
        f, y = step.task.train.features, step.task.train.labels
        for c in step.task.classes:
            torch.testing.assert_close(s.strategy.head.weight[c], f[y == c].mean(0))
    # and the head predicts the nearest prototype by cosine
    w = torch.nn.functional.normalize(s.strategy.head.weight, dim=1)
    z = torch.nn.functional.normalize(step.test.features, dim=1)
    assert torch.equal(s.strategy.predict(step.test).argmax(1), (z @ w.T).argmax(1))


def test_class_means_error_on_missing_class():
    import pytest

    from clbench.errors import ClbenchError

    with pytest.raises(ClbenchError):
        class_means(torch.zeros(4, 2), torch.tensor([0, 0, 1, 1]), [0, 2])
