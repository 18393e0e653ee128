"""Stand-ins for the AWS APIs moto lacks, used only by tests and the local world (README.md)."""
