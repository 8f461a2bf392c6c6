"""One module per CLI area; each registers its commands on cli.app.app when imported."""
