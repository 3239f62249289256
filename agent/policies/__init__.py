"""Policies that drive a Session: llm (OpenAI tool calling), search, random, replay."""
