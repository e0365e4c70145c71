from __future__ import annotations

import subprocess
import sys
import textwrap

#: A process whose main thread holds the stop event's own lock when its stop signal lands,
#: as it does for a few bytecodes each time a timed ``Event.wait`` wakes: the handler runs
#: right there, inside the ``with``.
_HELD = textwrap.dedent(
    """
    import os, signal, threading
    from crashqueuelab.lab.runs.stopsignals import event_set_by

    stop = event_set_by(signal.SIGUSR1, signal.SIGUSR2)
    (relay,) = [thread for thread in threading.enumerate() if thread.name == "stop-signals"]
    with stop._cond:
        os.kill(os.getpid(), signal.SIGUSR1)
        assert not stop.is_set()
    assert stop.wait(10)
    os.kill(os.getpid(), signal.SIGUSR2)
    assert stop.is_set()
    relay.join(10)
    print("stopped", relay.is_alive())
    """
)


def test_a_stop_signal_that_lands_while_the_main_thread_holds_the_events_lock_stops() -> None:
    # A handler that set the event itself would wait for that lock for ever (a worker that
    # never stops): run apart, so that such a regression fails on the timeout.
    done = subprocess.run(
        [sys.executable, "-c", _HELD], capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0, done.stderr
    # The thread that set the event ended with it.
    assert done.stdout.strip() == "stopped False", done.stdout
