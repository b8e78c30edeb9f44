"""What an agent declares about each of its runs from the run's input, computed once when the
run starts and kept on it (`register_agent(agent, ...)`'s keywords): its concurrency key, the
business key its runs take turns on (`concurrency.py`), and its scope, what the run may act on
(`scopes.py`)."""
