"""Model files: the pinned catalog of real models and its pull (:mod:`.catalog`,
:mod:`.pull`, :mod:`.pinned`), the models converted at pull (:mod:`.converted`,
:mod:`.bert_gguf`, :mod:`.safetensors_file`), the demo model (:mod:`.demo`) and
the atomic GGUF write they share (:mod:`.gguf_write`)."""
