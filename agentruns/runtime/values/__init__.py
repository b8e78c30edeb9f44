"""Small value helpers shared by the runtime: ids, money, text, timestamps and redaction."""
