import { defineConfig } from 'vite';

// The build lands in internal/ui/dist, which the Go binary embeds
// (internal/ui); the server serves it at /ui/.
export default defineConfig({
  base: '/ui/',
  build: {
    outDir: process.env.AIRLOCK_UI_OUT || '../internal/ui/dist',
    emptyOutDir: true,
    assetsDir: 'assets',
    sourcemap: false,
    target: 'es2022',
    // No polyfill: it would be one more script; every supported browser
    // has modulepreload.
    modulePreload: { polyfill: false },
    chunkSizeWarningLimit: 600,
  },
});
