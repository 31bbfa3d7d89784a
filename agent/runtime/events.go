package runtime

import (
	"context"
	"fmt"

	apievents "github.com/containerd/containerd/api/events"
	"github.com/containerd/typeurl/v2"
)

// TaskEvent is a task exit or OOM in holdfast's namespace.
type TaskEvent struct {
	ContainerID string
	OOM         bool
}

// SubscribeTaskEvents calls fn for every task exit and OOM in holdfast's namespace until ctx
// ends or the subscription fails; it returns the subscription's error.
func (r *Runtime) SubscribeTaskEvents(ctx context.Context, fn func(TaskEvent)) error {
	ns := fmt.Sprintf("namespace==%q", r.namespace)
	ch, errs := r.client.Subscribe(ctx, ns+`,topic=="/tasks/exit"`, ns+`,topic=="/tasks/oom"`)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-errs:
			return err
		case env := <-ch:
			if env == nil || env.Event == nil {
				continue
			}
			v, err := typeurl.UnmarshalAny(env.Event)
			if err != nil {
				continue
			}
			switch e := v.(type) {
			case *apievents.TaskExit:
				fn(TaskEvent{ContainerID: e.ContainerID})
			case *apievents.TaskOOM:
				fn(TaskEvent{ContainerID: e.ContainerID, OOM: true})
			}
		}
	}
}
