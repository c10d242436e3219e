"""The ``kpack`` command line, the top of the stack: one module per command group (build,
query, eval, serve, store), assembled by cli.main. A command parses its arguments, calls the
package that owns the work (pipelines, retrieval, serving, kpack) and prints the result."""
