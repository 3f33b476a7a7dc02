"""A synchronous learner's torch threads, chosen by timing its first updates both ways."""

from walle_ray.runtime.threads import ThreadChoice


def run(choice: ThreadChoice, per_step: dict[int, float], warm_up_s: float = 9.0):
    """Feeds ``choice`` updates of 10 gradient steps timed by ``per_step`` until it chooses;
    returns the thread counts it asked for and the line it gave."""
    asked, line = [], None
    while choice.chosen is None:
        threads = choice.next()
        asked.append(threads)
        seconds = warm_up_s if not asked[:-1] else per_step[threads] * 10
        line = choice.timed(threads, seconds, 10)
    return asked, line


def test_small_steps_that_threads_slow_down_run_on_one():
    choice = ThreadChoice(2)
    asked, line = run(choice, {2: 3.4e-3, 1: 1.6e-3})
    assert asked == [1, 2, 1, 2, 1, 2, 1] and choice.chosen == 1 and choice.next() == 1
    assert line.startswith("walle_ray: learner: 1 torch thread, 1.60 ms a gradient step "
                           "against 3.40 ms with 2")
    assert choice.timed(1, 1.0, 10) is None  # said once


def test_steps_that_threads_speed_up_keep_them_and_the_warm_up_is_not_counted():
    choice = ThreadChoice(4)
    asked, line = run(choice, {4: 2.0e-3, 1: 2.6e-3}, warm_up_s=100.0)
    assert asked == [1, 4, 1, 4, 1, 4, 1] and choice.chosen == 4
    assert choice.per_step == {4: [2.0e-3] * 3, 1: [2.6e-3] * 3}
    assert "4 torch threads, 2.00 ms a gradient step against 2.60 ms with 1" in line


def test_one_thread_has_nothing_to_choose():
    choice = ThreadChoice(1)
    assert choice.chosen == 1 and choice.next() == 1 and choice.timed(1, 1.0, 5) is None
