package outbox

import (
	"context"
	"fmt"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/twmb/franz-go/pkg/kgo"
)

// AddValue adds the record of v, encoded with c, to topic with key, to w's
// outbox inside tx; see Writer.Add (Writer{} is the default outbox). An
// encode error (a value c cannot encode, a schema registry that refuses
// the schema) is returned and nothing is written.
func AddValue[T any](ctx context.Context, w Writer, tx Querier, c consumer.Encoder[T], topic string, key []byte, v T) (string, error) {
	b, err := c.Encode(ctx, topic, v)
	if err != nil {
		return "", fmt.Errorf("outbox: encoding a value for topic %s: %w", topic, err)
	}
	return w.Add(ctx, tx, &kgo.Record{Topic: topic, Key: key, Value: b})
}
