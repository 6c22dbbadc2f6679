"""The serving benchmark (``bench/serve.py``): lmsp against llama-server, same model, same load.

Modules by job: ``servers`` starts and stops them, ``protocols`` and ``load``
make the requests and time them, ``procs`` reads memory and CPU time from
/proc, ``stats`` and ``report`` turn levels into figures, tables and goal
checks, ``profiler`` samples a server, ``cli`` is the command line.
"""
