from regen.cli.main import console

console()
