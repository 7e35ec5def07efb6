package dbscope

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Execer is the narrowest handle CleanupInbox needs: a *pgxpool.Pool or a
// *pgx.Conn.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// CleanupOptions say which inbox rows CleanupInbox deletes.
type CleanupOptions struct {
	TablePrefix string        // "" selects DefaultTablePrefix
	Consumer    string        // required: whose rows
	TTL         time.Duration // required: rows older than this go
	Batch       int           // rows per DELETE; 0 selects DefaultCleanupBatch
}

// CleanupInbox deletes one consumer's inbox rows older than the TTL, at most
// Batch rows per statement so that no single statement holds locks for long,
// until none is left. It returns how many rows it deleted. Only rows of
// records with an outcome (applied, skipped, stale or dead-lettered) go, and
// their age counts from that outcome.
func CleanupInbox(ctx context.Context, db Execer, o CleanupOptions) (int64, error) {
	if o.TablePrefix == "" {
		o.TablePrefix = DefaultTablePrefix
	}
	if err := validPrefix(o.TablePrefix); err != nil {
		return 0, err
	}
	if o.Consumer == "" || o.TTL <= 0 {
		return 0, errors.New("dbscope: CleanupInbox needs a Consumer and a positive TTL")
	}
	if o.Batch <= 0 {
		o.Batch = DefaultCleanupBatch
	}
	p := o.TablePrefix
	sql := `DELETE FROM ` + p + `inbox WHERE ctid = ANY (ARRAY(
		SELECT ctid FROM ` + p + `inbox
		WHERE consumer = $1 AND processed_at < now() - $2::interval AND status IN ('applied', 'dead')
		LIMIT $3))`
	var total int64
	for {
		tag, err := db.Exec(ctx, sql, o.Consumer, o.TTL, o.Batch)
		if err != nil {
			return total, err
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(o.Batch) {
			return total, nil
		}
	}
}
