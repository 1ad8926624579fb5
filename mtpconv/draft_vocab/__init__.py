"""Frequency-ranked draft vocabularies: the checkpoint's tokenizer, counting, selection, plot.

The ``build-draft-vocab`` command (:mod:`mtpconv.commands.build_draft_vocab`)
puts these together; the ids file it writes is :mod:`mtpconv.formats.draft_ids`.
"""
