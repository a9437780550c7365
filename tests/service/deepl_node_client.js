// DeepL's official Node client (npm deepl-node), unchanged, against the service: a few calls,
// each one's outcome printed as one JSON object for tests/service/test_deepl_clients.py to read.
// Usage: NODE_PATH=DIR/node_modules node deepl_node_client.js SERVER_URL KEY
const deepl = require('deepl-node');

async function outcome(call) {
  try {
    return { ok: await call() };
  } catch (error) {
    return { error: error.constructor.name, message: error.message };
  }
}

async function main() {
  const [serverUrl, key] = process.argv.slice(2);
  const translator = new deepl.Translator(key, { serverUrl, maxRetries: 0 });
  const wrong = new deepl.Translator('not-a-key', { serverUrl, maxRetries: 0 });
  const results = {
    one: await outcome(() => translator.translateText('A man is riding a bike.', 'en', 'de')),
    many: await outcome(() => translator.translateText(
      ['A dog runs in the snow.', 'Ein Hund läuft durch den Schnee.'], null, 'en-US',
    )),
    html: await outcome(() => translator.translateText(
      '<p>A man in a <b>blue</b> shirt. <span>Keep this.</span></p>', 'en', 'de',
      { tagHandling: 'html', ignoreTags: ['span'] },
    )),
    sources: await outcome(() => translator.getSourceLanguages()),
    targets: await outcome(() => translator.getTargetLanguages()),
    usage: await outcome(async () => (await translator.getUsage()).character),
    wrongKey: await outcome(() => wrong.translateText('A dog.', 'en', 'de')),
    unsupported: await outcome(() => translator.translateText('A dog.', 'en', 'fr')),
    glossary: await outcome(async () => {
      const entries = new deepl.GlossaryEntries({ entries: { man: 'Herr' } });
      const made = await translator.createGlossary('node', 'en', 'de', entries);
      const used = await translator.translateText(
        'A man is riding a bike.', 'en', 'de', { glossary: made },
      );
      const read = (await translator.getGlossaryEntries(made)).entries();
      await translator.deleteGlossary(made);
      return {
        made, entries: read, text: used.text, listed: (await translator.listGlossaries()).length,
      };
    }),
  };
  process.stdout.write(JSON.stringify(results));
}

main();
