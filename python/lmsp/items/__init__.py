"""Items: as a response's ``input_items`` and a conversation's list show them
(:mod:`.listed`), and the output items of a task on the chat layer (:mod:`.chat`)."""
