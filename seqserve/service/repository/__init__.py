"""The model repository of an API process: every model version it serves, each with its
state and worker (`entries`), and this process's side of the model control (`control`):
above the engines and workers it holds, below the HTTP plumbing (`web`) and the routes
(`api`) that read it. No web framework: the server's settings reach it as
`entries.RepositorySettings`."""
