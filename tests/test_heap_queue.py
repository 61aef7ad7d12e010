"""HeapQueue: a sorted run for entries pushed in key order, a heap for the rest, one order."""

from hypothesis import given, settings
from hypothesis import strategies as st

from simsched.policies.queues import HeapQueue
from simsched.request import Request


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["push", "push", "pop", "forget"]),
                          st.integers(0, 6)), min_size=1, max_size=60))
def test_pops_follow_key_order_whatever_the_push_order(ops):
    """Pushes in and out of key order, pops and forgets (the scheduler's peek-then-forget) give
    the order of one heap: smallest key first, ties by push order."""
    queue = HeapQueue(lambda r, now: (r.priority,))
    model = []                     # (key, push number, id) of the live requests
    pushed = 0
    for op, key in ops:
        if op == "push":
            req = Request(pushed, 0.0, 10, 5, priority=key)
            queue.push(req, 0.0)
            model.append(((key,), pushed, req.id))
            pushed += 1
        elif model:
            expected = min(model)
            head = queue.peek()
            assert head.id == expected[2]
            if op == "pop":
                assert queue.pop() is head
            else:
                del queue._live[head.id]           # what the scheduler does after a peek
            model.remove(expected)
        assert len(queue) == len(model)
        assert sorted(r.id for r in queue) == sorted(m[2] for m in model)


def test_in_order_pushes_never_touch_the_heap():
    queue = HeapQueue(lambda r, now: (r.arrival_at, r.id))
    for i in range(5):
        queue.push(Request(i, float(i), 10, 5), float(i))
    assert not queue._heap and len(queue._run) == 5
    queue.push(Request(9, 0.5, 10, 5), 6.0)        # a requeued victim: earlier than the run's tail
    assert len(queue._heap) == 1
    assert [queue.pop().id for _ in range(6)] == [0, 9, 1, 2, 3, 4]
