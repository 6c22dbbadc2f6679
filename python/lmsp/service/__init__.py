"""The life of a request as a task, between the web layer and the runtime:
creation under an idempotency key, delivery (stream, background, wait),
cancellation, deletion and forgetting (:mod:`.tasks`); the turns a response
continues (:mod:`.turns`); a task's event log as a stream (:mod:`.streams`);
conversations (:mod:`.conversations`); the keys of requests that make no task
(:mod:`.keys`). Nothing here knows HTTP."""
