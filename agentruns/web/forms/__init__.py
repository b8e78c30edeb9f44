"""The forms that start runs: fields from an agent's input schema, and the one-time token that makes a double click one run."""
