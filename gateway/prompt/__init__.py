"""A request's prompt as routing reads it: prefix keys (block hashes), chat rendering and tokenizers.

Pure of I/O but for the replica tokenizer; imports config, support and the top-level modules only.
"""
