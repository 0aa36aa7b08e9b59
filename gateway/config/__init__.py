"""The config file: YAML sections as frozen pydantic models, `${VAR}` expansion, secrets from files, and
validation with errors that name the key.

Imports nothing of the gateway but `gateway.errors`: every feature imports its section from here.
"""
