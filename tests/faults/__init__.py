"""The fault suite (`make test-faults`): real processes, injected faults, a consistency checker;
see README "Fault suite"."""
