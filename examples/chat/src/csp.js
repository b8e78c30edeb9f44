// Imported first (ES modules evaluate in import order): the `ai` client validates the stream's
// chunks with zod, which probes `new Function` once, when its first schema is built, to pick a
// faster path. Under the page's Content Security Policy (no 'unsafe-eval') the probe is refused
// and reported as a violation, although zod catches it. `jitless` skips the probe: zod
// validates the same, without JIT. Its global configuration lives on globalThis, so setting it
// before zod loads is enough.
globalThis.__zod_globalConfig = { ...(globalThis.__zod_globalConfig || {}), jitless: true };
