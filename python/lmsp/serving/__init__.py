"""The service under gunicorn: its configuration and master hooks
(:mod:`.gunicorn_conf`), the gevent worker (:mod:`.gunicorn_worker`), idle
keep-alive connections (:mod:`.idle_connections`), the wind-down of a stopping
worker (:mod:`.winddown`) and store calls kept off the gevent hub (:mod:`.hubsafe`)."""
