"""Pure checks of Traces, each returning a Verdict."""
