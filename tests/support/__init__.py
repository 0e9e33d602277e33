"""Test doubles for the serving layer; product code (impl/) never imports this package.

- ``fake_engine``: a deterministic engine with no model, loaded by runner processes in tests with
  ``--engine tests.support.fake_engine:load`` (``FAKE_ENGINE``) and its own ``--fake-*`` flags.
- ``in_process_runner``: ``InProcessRunner``, a runner without a process for scheduler tests and
  the scheduler state machine.
Runner processes find this package because serve.client starts them in the project root with the
root on PYTHONPATH.
"""
