"""A run's conversation: threads of runs stored through Pydantic AI's `ConversationStore`."""
