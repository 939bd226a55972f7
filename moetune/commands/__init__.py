"""One module per `moetune` subcommand; each exports a click command of the same name."""
