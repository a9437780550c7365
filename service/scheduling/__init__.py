"""Requests to engine calls: the batcher, and the runtime that routes language pairs to models."""
