package outbox

import (
	"context"

	"github.com/kscope-dev/kscope/codec"
)

// AddValue adds the record of v, encoded with c, to topic with key, to w's
// outbox inside tx; see Writer.Add (Writer{} is the default outbox). An
// encode error (a value c cannot encode, a schema registry that refuses
// the schema) is returned and nothing is written.
func AddValue[T any](ctx context.Context, w Writer, tx Querier, c codec.Codec[T], topic string, key []byte, v T) (string, error) {
	rec, err := codec.NewRecord(ctx, c, topic, key, v)
	if err != nil {
		return "", err
	}
	return w.Add(ctx, tx, rec)
}
