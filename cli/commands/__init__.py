"""One module per CLI area; each registers its commands on flows.app.app when imported."""
