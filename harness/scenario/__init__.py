"""What to run: prompt sets as scenarios, the models a session resolves, local model folders."""
