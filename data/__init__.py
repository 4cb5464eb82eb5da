"""Tokenizers, corpus preparation into token shards, and the resumable distributed loader."""
