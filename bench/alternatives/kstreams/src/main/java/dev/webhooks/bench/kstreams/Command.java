package dev.webhooks.bench.kstreams;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.Headers;

/**
 * The command record for a first copy, the envelope bench/alternatives/common.py builds: {"command",
 * "key", "effect_key", "source", "event_type", "received_at", "event"}. The body is parsed and the
 * envelope written anew, the same per-record work the Python contenders do.
 */
final class Command {
  private static final ObjectMapper JSON = new ObjectMapper();

  private Command() {}

  static byte[] of(byte[] key, byte[] body, Headers headers) {
    try {
      JsonNode event = JSON.readTree(body);
      String text = new String(key, StandardCharsets.UTF_8);
      ObjectNode out = JSON.createObjectNode();
      out.put("command", "handle");
      out.put("key", text);
      out.put("effect_key", text);
      String source = header(headers, "source");
      out.put("source", source != null ? source : text.split(":", 2)[0]);
      out.set("event_type", event.get("type"));
      String received = header(headers, "received-at");
      if (received != null) {
        out.put("received_at", Long.parseLong(received));
      } else {
        out.putNull("received_at");
      }
      out.set("event", event);
      return JSON.writeValueAsBytes(out);
    } catch (JsonProcessingException error) {
      throw new IllegalArgumentException("the body of " + new String(key, StandardCharsets.UTF_8)
          + " is not JSON: " + error.getOriginalMessage(), error);
    } catch (IOException error) {
      throw new UncheckedIOException(error);
    }
  }

  private static String header(Headers headers, String name) {
    Header found = headers.lastHeader(name);
    return found == null ? null : new String(found.value(), StandardCharsets.UTF_8);
  }
}
