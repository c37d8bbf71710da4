"""The rules: pure decisions, no I/O, no clock, no threads (the slot FSM, posture, budget, plan, roles, dispatch, ledger, outcomes)."""
