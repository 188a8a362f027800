"""The session a suite talks to (HilSession), what it tells listeners, and what it counts."""
