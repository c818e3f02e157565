// Reads Gemini streams whose final event the mock splits at a given byte offset, with
// the official @google/genai SDK's own stream reader, through handoff.
//
// Usage: node genai_final_event_splits.mjs OFFSET...   (HANDOFF_URL and
// HANDOFF_NODE_MODULES in the environment). For each offset, one streamed request
// whose user text is "split OFFSET"; prints a JSON list of what the SDK saw.
import { createRequire } from "node:module";

const require = createRequire(`${process.env.HANDOFF_NODE_MODULES}/`);
const { GoogleGenAI } = require("@google/genai");

const ai = new GoogleGenAI({
  apiKey: "AIza-split-test",
  httpOptions: { baseUrl: process.env.HANDOFF_URL },
});
const results = [];
for (const offset of process.argv.slice(2)) {
  const stream = await ai.models.generateContentStream({
    model: "gemini-mock",
    contents: `split ${offset}`,
  });
  let text = "";
  let usage = null;
  let finish = null;
  for await (const chunk of stream) {
    text += chunk.text ?? "";
    usage = chunk.usageMetadata?.promptTokenCount ?? usage;
    finish = chunk.candidates?.[0]?.finishReason ?? finish;
  }
  results.push({ offset: Number(offset), text, usage, finish });
}
process.stdout.write(JSON.stringify(results));
