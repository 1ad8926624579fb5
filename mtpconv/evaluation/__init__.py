"""``mtpconv eval``: serve a source and its variant in the user's vLLM, one fresh process per row.

:mod:`rows` says what each row serves, :mod:`runner` starts one process per row and
collects what it wrote, :mod:`worker` is that process (it imports vLLM), :mod:`probe`
runs inside vLLM's worker to read which method and kernel each drafter module got,
:mod:`report` compares the rows.
"""
