"""Requests as clients send them, checked: each endpoint's fields, their
defaults and limits, and the task a request makes. Every check raises
:class:`~lmsp.errors.InvalidRequest` naming the field as the client wrote it.
Nothing here knows HTTP or the store.

The objects the service answers with are declared here too, for the OpenAPI
document (:mod:`.answers`, :mod:`.openai_answers`, :mod:`.conversation_answers`)."""
