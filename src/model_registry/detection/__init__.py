"""What a model directory holds: its `Layout` (`layout.detect`), decided by the rules that no
family owns and every family's own (`rules`)."""
