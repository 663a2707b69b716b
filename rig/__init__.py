"""Test rigs for fdl-tasks: simulated ssh worker hosts (sshrig) and the docker builder."""
