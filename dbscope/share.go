package dbscope

import (
	"errors"

	"github.com/kscope-dev/kscope/consumer"
)

// checkShare refuses the options a share group (consumer.Config.Share)
// cannot keep. The inbox is what makes a share group's effects
// exactly-once: a record delivered again (a crash, a lock that expired
// while its handler ran, a release) meets its inbox row and is a no-op.
func checkShare(cfg consumer.Config, o Options) error {
	if cfg.Share == nil {
		return nil
	}
	var errs []error
	if o.StoreOffsets {
		errs = append(errs, &consumer.ConfigError{Struct: "dbscope.Options", Field: "StoreOffsets",
			Reason: "is set with Config.Share: a share group hands out a partition's records out of order and to several members, so no offset says how far a key-shard applied it; leave StoreOffsets false (the inbox deduplicates redeliveries)"})
	}
	if o.Versions != nil {
		errs = append(errs, &consumer.ConfigError{Struct: "dbscope.Options", Field: "Versions",
			Reason: "is set with Config.Share: versions are applied in per-key order, which a share group does not keep across its members; use a consumer group for versioned topics, or leave Versions nil"})
	}
	return errors.Join(errs...)
}
