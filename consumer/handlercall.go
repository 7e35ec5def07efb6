package consumer

import (
	"context"

	"github.com/kscope-dev/kscope/internal/guard"
)

// Admit implements scope.Engine: the admission rules (Config.Filter,
// MaxAge) applied to r before its handler runs.
func (e engineOf) Admit(r *Record) error { return e.f.admit(r) }

// Call implements scope.Engine.
func (e engineOf) Call(ctx context.Context, r *Record, call func(ctx context.Context) error) error {
	if err := e.f.admit(r); err != nil {
		return err
	}
	return e.f.call(ctx, r, call)
}

// CallBatch implements scope.Engine.
func (e engineOf) CallBatch(ctx context.Context, rs []*Record, call func(ctx context.Context) error) error {
	if len(rs) == 0 {
		return nil
	}
	return e.f.call(ctx, rs[0], call)
}

// admit returns why r is turned away before its handler, or nil.
func (f *failures) admit(r *Record) error { return nil }

// call runs one handler call for r under the stall watch and the panic
// guard.
func (f *failures) call(ctx context.Context, r *Record, call func(ctx context.Context) error) error {
	handling(r)
	defer handled(r)
	return guard.Call(func() error { return call(ctx) })
}
