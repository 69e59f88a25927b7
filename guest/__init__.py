"""trainctl's guest room: everything trainctl runs inside a training rank's own process.

That code lives in someone else's program. Its rules, each guarded by a test
(tests/test_guest_rules.py for the room, tests/test_guest.py for programs run with it):

1. Nothing at import but definitions. No thread, socket, file, handler (signal, atexit, at-fork)
   or environment change comes from importing any module here; each is made when the rank first
   reports (its first step), and only in the rank's own process.
2. Never raise into the program, never block it. Every call returns at once; a failure is
   dropped, with one warning per process at most (through `warnings`, which a program can filter).
3. Signals are the program's. The one thread this room starts (the activity sampler) has every
   signal blocked, so a signal the program waits for (sigwait, signalfd) or handles reaches the
   program's threads only; handlers are read (`signal.getsignal`), never set.
4. The program's modules win. The room imports only built-in and underscore modules of the
   standard library that a program's file cannot stand in for, and its own modules, which the
   bootstrap loads under their dotted names `trainctl.guest.*` without adding `trainctl` (or any
   other top-level name) to the program's modules. The bootstrap puts nothing ahead of the
   program's own directory on sys.path: its folder is off sys.path before the program starts.
5. The environment is read, never written. The thread is invisible to `threading` (started
   with `_thread`), paused around `os.fork()` and ended at the interpreter's exit.
6. Nothing another user can reach: the files the room reads or writes on the node lie in the job
   user's private directory (trainctl.private_dir), and one another user owns is refused; what it
   writes into the job's directory (the watch folder, the checkpoint marker) and everything it
   opens, it opens without following a link or blocking.
7. Measured: a rank's start-up, a step and the sampler each have a bench (docs/performance.md).

Modules: `wire` (the names and the datagram the node agent reads), `reporter` (the rank's counters
and reports), `activity` (the sampler), `requests` (the watch's checkpoint requests), `signal_judge`
(whether the job's signal would get a save), `saves` (telling trainctl of a save),
`save_hooks` (the program's saves seen with no code: torch.save, torch.distributed.checkpoint,
safetensors, Lightning), `hook` (the optimizer step hook, and each hook's installer), `bootstrap/`
(the `sitecustomize` rank-exec puts on PYTHONPATH).
The public API for programs is `trainctl.progress`, which the framework integrations use too.
"""
