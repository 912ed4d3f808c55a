"""Stopping cleanly: stop signals that ask for a stop, children that die with their parent,
and terminate-then-kill with a deadline.

Every long-running command stops on SIGTERM (what systemd, ``docker stop`` and ``timeout``
send) exactly as on Ctrl-C. SIGINT is left ignored where it was ignored at start: a script's
background job ignores it, so SIGTERM is the way to stop such an instance.

A parent that starts dctwin children (``dctwin demo``) starts each in its own session, so that
a Ctrl-C or hang-up of the terminal reaches only the parent, which then stops them in order; it
names itself in ``DCTWIN_PARENT_PID``, and a child that finds its parent gone (killed with
SIGKILL, say) sends itself SIGTERM: nothing outlives the parent, without Linux-only ``prctl``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterable

log = logging.getLogger(__name__)

#: The environment variable a child reads to exit with its parent.
PARENT_ENV = "DCTWIN_PARENT_PID"


def on_stop_signals(stop: threading.Event, *, hup: bool = True) -> list[signal.Signals]:
    """Make SIGTERM, SIGINT (unless ignored) and, with ``hup``, SIGHUP (unless ignored, e.g.
    under ``nohup``) set ``stop``; returns the signals handled."""
    wanted = [signal.SIGTERM, signal.SIGINT]
    if hup and hasattr(signal, "SIGHUP"):
        wanted.append(signal.SIGHUP)
    handled = []
    for sig in wanted:
        if sig != signal.SIGTERM and signal.getsignal(sig) is signal.SIG_IGN:
            continue
        signal.signal(sig, lambda *_: _set_later(stop))
        handled.append(sig)
    return handled


def _set_later(stop: threading.Event) -> None:
    """Set ``stop`` from a signal handler, on a thread of its own. A handler runs in the main
    thread between two bytecodes, possibly while that thread holds the event's own lock
    (inside ``stop.wait()``, just after a timeout): ``stop.set()`` there waits for a lock its
    own thread holds and never returns, and the command never stops. A new thread takes the
    lock once the main thread lets it go."""
    threading.Thread(target=stop.set, name="stop-signal", daemon=True).start()


def lower_this_thread(nice: int) -> bool:
    """Raise the calling thread's nice value by ``nice`` (Linux, where a thread has its own
    nice value): the scheduler then runs it after the threads that keep their priority (the
    ingest's writer and the API), when both want a core. True when it was changed.

    Elsewhere ``setpriority`` would renice the whole process, so it is left as it is there."""
    if nice <= 0 or not os.path.isdir("/proc/self/task"):
        return False
    tid = threading.get_native_id()
    try:
        now = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(19, now + nice))
    except OSError as e:  # a container that forbids it: run at the process's priority
        log.warning(
            "cannot lower the priority of thread %s: %s", threading.current_thread().name, e
        )
        return False
    return True


def exit_with_parent(poll_s: float = 0.5) -> None:
    """If ``DCTWIN_PARENT_PID`` is set, SIGTERM this process once that parent is gone.

    The variable is removed from the environment, so this process's own children do not
    inherit a parent that is not theirs.
    """
    value = os.environ.pop(PARENT_ENV, None)
    if not value or not value.isdigit():
        return
    parent = int(value)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        log.warning("parent process %d is gone: stopping", parent)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="dctwin-parent-watch", daemon=True).start()


def _signal_group(p: subprocess.Popen, sig: int) -> None:
    """``sig`` to ``p``'s process group (it leads one: started with a new session), else to
    ``p`` alone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if p.poll() is None and os.getpgid(p.pid) == p.pid:
            os.killpg(p.pid, sig)
            return
    with contextlib.suppress(ProcessLookupError):
        if p.poll() is None:
            p.send_signal(sig)


def stop_processes(
    procs: Iterable[subprocess.Popen], *, deadline_s: float, sig: int = signal.SIGTERM
) -> list[subprocess.Popen]:
    """Send ``sig`` to every process (and its group), wait up to ``deadline_s`` for all of
    them, then SIGKILL what is left. Returns the processes that had to be killed."""
    procs = list(procs)
    for p in procs:
        _signal_group(p, sig)
    end = time.monotonic() + deadline_s
    killed = []
    for p in procs:
        try:
            p.wait(max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            killed.append(p)
    for p in killed:
        log.warning("process %d ignored %s for %.0f s: killing it", p.pid, sig, deadline_s)
        _signal_group(p, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(5)
    return killed
