"""A worker's claims and leases: renewed while a model loads, never recovered by
the worker itself, claimed again after a recovery without running twice, and
never left on an engine that closed."""
from __future__ import annotations

import threading

from runtime_helpers import all_events, check_log, claimed_once_settled, queued, submit, wait_finished, wait_until

from lmsp import native


def test_tasks_claimed_behind_a_model_load_keep_their_leases(store, make_runtime, model_file):
    """One claim takes several tasks; the first loads the model, which may outlast a
    lease: the others are renewed meanwhile, not failed by a recovery."""
    ids: list[str] = []
    renewed_all = threading.Event()
    rounds = []
    real_renew, real_recover = store.renew, store.recover

    def renew(owner, **kwargs):
        if set(ids) <= set(kwargs.get("task_ids") or ()):
            rounds.append(1)
            if len(rounds) >= 4:  # more than a lease (renewals come every third of one)
                renewed_all.set()
        return real_renew(owner, **kwargs)

    def recover(**kwargs):
        report = real_recover(**kwargs)
        if any(report.get(key) for key in ("failed", "requeued", "resumed", "cancelled")):
            renewed_all.set()  # the failure this test looks for: no need to wait longer
        return report

    store.renew, store.recover = renew, recover

    def slow_engine(path, **kwargs):
        assert renewed_all.wait(60), "no renewal covered the waiting tasks"
        return native.Engine(path, **kwargs)

    rt = make_runtime(store, start=False, engine_factory=slow_engine)
    rt.register_model("tiny.gguf")
    ids += [submit(store, None, f"Question {i}", max_output_tokens=4) for i in range(3)]
    rt.start()
    queued(rt)
    tasks = [wait_finished(rt, store, t) for t in ids]
    assert [(t["status"], t["error"]) for t in tasks] == [("completed", None)] * 3
    assert len(rounds) >= 4


def test_a_worker_never_recovers_its_own_tasks(store, runtime):
    """A wall clock stepped forward (an edge box setting its clock after boot) makes
    every lease look expired: the worker's own tasks run on, untouched."""
    reference = wait_finished(runtime, store, submit(store, runtime, "Count on:", max_output_tokens=300))
    expected = store.output_text(reference["id"])
    real_clock = store._clock
    offset = [0.0]
    store._clock = lambda: real_clock() + offset[0]
    tid = submit(store, runtime, "Count on:", max_output_tokens=300, on_restart="resume")
    wait_until(runtime, store, tid, lambda t: t["last_sequence_number"] >= 8)
    offset[0] = 3600.0
    runtime.committer.recover_dead()  # the commit thread's round
    task = wait_finished(runtime, store, tid)
    assert task["status"] == "completed" and task["attempts"] == reference["attempts"]
    assert "task.resumed" not in check_log(all_events(store, tid))
    assert store.output_text(tid) == expected


def test_a_task_recovered_from_its_worker_and_claimed_back_runs_once(store, runtime):
    """Another worker recovered the task (this one's renewals had failed for a lease)
    and this worker claimed it again: the old run stops, and what it had not committed
    is refused by the store, so the output is one run's, resumed where its log ended."""
    reference = wait_finished(runtime, store, submit(store, runtime, "Count on:", max_output_tokens=300))
    expected = store.output_text(reference["id"])
    tid = submit(store, runtime, "Count on:", max_output_tokens=300, on_restart="resume")
    wait_until(runtime, store, tid, lambda t: t["last_sequence_number"] >= 8)
    first = runtime.state.runs[tid]
    # another worker's recovery round, with this worker's lease run out
    report = store.recover(startup=False, now=store._clock() + 3600)
    assert report["resumed"] == [tid]
    queued(runtime)
    task = wait_finished(runtime, store, tid)
    assert task["status"] == "completed"
    assert check_log(all_events(store, tid)).count("task.resumed") == 1
    assert store.output_text(tid) == expected
    assert (id(first.engine), first.seq) not in runtime.state.by_seq
    assert tid not in runtime.state.runs


def test_a_task_starting_as_its_model_unloads_loads_it_again(store, runtime):
    wait_finished(runtime, store, submit(store, runtime, max_output_tokens=2))  # loads the model
    started = {}
    real_close = runtime.registry.close_engine

    def close_engine(model_id, engine):
        # the model has left the registry, its engine not closed yet: a task arrives
        tid = submit(store, runtime, "Count on:", max_output_tokens=8)
        started["task"] = wait_finished(runtime, store, tid)
        started["engine"] = runtime.registry.engine(model_id)
        real_close(model_id, engine)

    runtime.registry.close_engine = close_engine
    runtime.unload_model("tiny")
    assert started["task"]["status"] == "completed"
    assert started["engine"] is not None  # loaded again for the task
    assert runtime.registry.engine("tiny") is started["engine"] and not started["engine"].closed


def test_a_task_whose_engine_closes_under_it_ends(store, runtime):
    """Nothing polls a closed engine: the run must not hold its slot and its lease for ever."""
    wait_finished(runtime, store, submit(store, runtime, max_output_tokens=2))  # loads the model
    closed = []
    notify = runtime.waiters.notify

    def close_at_first_commit(task_ids):
        # in the commit thread, right after the first commit of the task's output: the
        # engine goes while the task runs, however busy the machine (a wait from the
        # test could find the task already at its end)
        notify(task_ids)
        run = next((runtime.state.runs.get(t) for t in task_ids if runtime.state.runs.get(t)), None)
        if not closed and run is not None and run.seq is not None:
            closed.append(runtime.registry.detach("tiny"))  # closed behind the runtime's back
            closed[0].close()

    runtime.waiters.notify = close_at_first_commit
    tid = submit(store, runtime, "Count on:", max_output_tokens=4000)
    task = wait_finished(runtime, store, tid)
    assert closed  # the engine went while the task ran
    assert task["status"] == "failed" and task["error"]["code"] == "engine_error"
    assert claimed_once_settled(runtime) == 0


def test_a_cancel_from_another_process_reaches_a_stream_while_the_model_loads(store, make_runtime, model_file):
    """The task is claimed here and its model loads; another process cancels it (the
    store ends a loading task at once): a stream waiting in this worker wakes now, not
    when the load is over."""
    loading, release = threading.Event(), threading.Event()

    def slow_engine(path, **kwargs):
        loading.set()
        assert release.wait(60)
        return native.Engine(path, **kwargs)

    rt = make_runtime(store, engine_factory=slow_engine)
    rt.register_model("tiny.gguf")
    tid = submit(store, rt, max_output_tokens=4)
    try:
        assert loading.wait(60)
        task = wait_until(rt, store, tid, lambda t: t["status"] == "loading")
        since = rt.commit_generation()
        stream = threading.Thread(target=rt.wait_for_commit,
                                  args=(tid, task["last_sequence_number"], 60), kwargs={"since": since})
        stream.start()
        # the stream waits on the watch thread, which reads the store for it
        wait_until(None, store, tid, lambda t: tid in rt.watcher.watched)
        other = type(store).open(store._db.path)  # another process's connections
        try:
            assert other.cancel(tid)["status"] == "cancelled"
        finally:
            other.close()
        stream.join(60)
        assert not stream.is_alive() and not release.is_set()
        assert store.get_task(tid)["status"] == "cancelled"
    finally:
        release.set()
    wait_until(rt, store, tid, lambda t: tid not in rt.state.runs)


def test_a_draining_worker_claims_nothing_more(store, make_runtime, model_file, monkeypatch):
    """SIGTERM (a stop, or a reload's old worker): what is queued is left to the others."""
    from lmsp.runtime import core

    said = []
    monkeypatch.setattr(core.log, "info", lambda msg, *args, **kwargs: said.append(msg % args))
    rt = make_runtime(store)
    rt.register_model("tiny.gguf")
    wait_finished(rt, store, submit(store, rt, max_output_tokens=2))
    rt.drain()
    rt.drain()  # a second SIGTERM (systemd's to every process, then the master's): said once
    # the scheduler's rounds from here on; a claim counts once one of them has begun (the
    # scheduler is one thread: a round begun before the drain, woken by the task that just
    # finished, has ended by then, and given back what its claim took after the drain)
    rounds = []
    real = rt.scheduler.claim_some
    rt.scheduler.claim_some = lambda: rounds.append(1) or real()
    claims = []
    real_claim = store.claim
    store.claim = lambda *a, **k: (rounds and claims.append(1)) or real_claim(*a, **k)
    assert [m for m in said if "draining" in m] == [f"runtime {rt.owner} draining: no more claims"]
    # a task put in the store all the same (the API answers 503 first) stays queued; /readyz says no
    assert rt.ready and rt.draining and rt.admission.reserve("tiny") is None
    tid = submit(store, rt, max_output_tokens=2)  # woken: a scheduler round
    wait_until(None, store, tid, lambda t: rounds)
    assert claims == [] and store.get_task(tid)["status"] == "queued"


def test_a_model_deleted_while_a_task_uses_it_unloads_when_the_task_ends(store, runtime):
    """The store refuses a delete while a task needs the model, but a run can outlive its
    task for a moment (or start before its task commits): such a model's engine goes
    once the worker's runs of it have ended."""
    tid = submit(store, runtime, "Count on:", max_output_tokens=4000)
    wait_until(runtime, store, tid, lambda t: t["last_sequence_number"] >= 4)
    with runtime.state.lock:
        runtime.models.close_when_idle.add("tiny")
    runtime.models.close_deleted()
    engine = runtime.registry.engine("tiny")
    assert engine is not None and not engine.closed  # its run goes on
    store.cancel(tid)
    runtime.notify_cancel(tid)
    wait_until(runtime, store, tid, lambda t: t["status"] == "cancelled" and tid not in runtime.state.runs)
    # the worker's own round may have closed it first, as the run ended; if not, this does
    runtime.models.close_deleted()
    assert runtime.registry.engine("tiny") is None and engine.closed and not runtime.models.close_when_idle


def test_a_drain_that_begins_during_a_claim_gives_back_what_it_took(store, make_runtime, model_file):
    """The scheduler's round looked before the drain; the store answered its claim
    after it: a draining worker keeps no claim, so the task goes back to the queue at
    once instead of running here."""
    rt = make_runtime(store)
    rt.register_model("tiny.gguf")
    taken = []
    real_claim = store.claim

    def claim(*args, **kwargs):
        claims = real_claim(*args, **kwargs)
        if claims:
            rt.drain()  # SIGTERM now, as the store answers
            taken.extend(c["task_id"] for c in claims)
        return claims

    def holder(task_id):
        with store._db.read() as conn:
            return store._task(conn, task_id)["owner"]

    store.claim = claim
    tid = submit(store, rt, max_output_tokens=2)
    # the claim came back: then either given back (no owner) or started (no longer queued)
    task = wait_until(None, store, tid, lambda t: tid in taken and (holder(tid) is None or t["status"] != "queued"))
    assert task["status"] == "queued" and holder(tid) is None and tid not in rt.state.runs
