"""`eval`: JavaScript run in V8 (mini-racer), inside worker processes the sandbox starts.

The service itself never imports mini-racer: V8 can abort its whole process when its heap is
exhausted (`Fatal JavaScript out of memory`), so each evaluation runs in a child
(`atmosphere.sandbox.js.worker`), and a child that dies is replaced while the call becomes an
`Error: ...` for the model.
"""
