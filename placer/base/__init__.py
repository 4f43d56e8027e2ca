"""The foundation every layer builds on: error types and exit codes (`errors`), guarded reading of
untrusted input files (`inputs`), atomic writes (`fileio`), the roles of an RL iteration
(`roles`) and the one palette and PNG writer of every figure (`palette`).

Nothing here imports anything else of the project, so the trace schema, the job model and
everything above can raise the same errors and read their inputs the same way.
"""
