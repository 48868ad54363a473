"""HTTP routes; each module exposes `router` (registered by `service.app.ROUTERS`)."""
