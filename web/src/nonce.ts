// The console's Content-Security-Policy allows no inline style but a
// <style> element that carries the nonce of the page's answer (the server
// puts it in <meta name="airlock-style-nonce">). The terminal emulator
// (xterm.js) writes its theme and cell metrics as <style> elements, so
// every <style> this page creates gets the nonce. Style attributes stay
// blocked (xterm uses them only for 24-bit colours, which then fall back to
// the default colour).
const meta = document.querySelector('meta[name="airlock-style-nonce"]');
const nonce = meta?.getAttribute('content') ?? '';
meta?.remove(); // read once; nothing else needs it in the DOM

if (nonce && !nonce.startsWith('__')) {
  const create = Document.prototype.createElement;
  Document.prototype.createElement = function (this: Document, tag: string, opts?: ElementCreationOptions) {
    const el = create.call(this, tag, opts);
    if (tag.toLowerCase() === 'style') el.setAttribute('nonce', nonce);
    return el;
  } as typeof Document.prototype.createElement;
}
