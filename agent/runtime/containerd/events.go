package containerd

import (
	"context"
	"fmt"

	apievents "github.com/containerd/containerd/api/events"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"
	"github.com/holdfast-dev/holdfast/agent/runtime"
)

// SubscribeTaskEvents calls fn for every exit of a container's main process and every OOM in
// holdfast's namespace until ctx ends or the subscription fails; it returns the
// subscription's error. subscribed is called once the subscription is in place: what
// happened before it (while containerd restarted, say) is not delivered, and the caller
// relists to learn it.
//
// Exits of exec'd processes (exec probes, kubectl exec) are left out: they change nothing in
// the container's state. Creates, starts and deletes are left out too: the agent makes them
// itself and observes the result; one made by anything else is found by the relist.
func (r *Runtime) SubscribeTaskEvents(ctx context.Context, subscribed func(), fn func(runtime.TaskEvent)) error {
	ns := fmt.Sprintf("namespace==%q", r.namespace)
	ch, errs := r.client.Subscribe(ctx, ns+`,topic=="/tasks/exit"`, ns+`,topic=="/tasks/oom"`)
	// The client sets the stream up before it returns and reports a failure to do so at once.
	select {
	case err := <-errs:
		return err
	default:
	}
	subscribed()
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
				if e.ID == "" || e.ID == e.ContainerID { // the init process, not an exec
					fn(runtime.TaskEvent{ContainerID: e.ContainerID})
				}
			case *apievents.TaskOOM:
				fn(runtime.TaskEvent{ContainerID: e.ContainerID, OOM: true})
			}
		}
	}
}

// PodOf returns the UID of the pod a container belongs to, from its record (containerd's
// metadata: no call to the container's shim); runtime.ErrNotFound for a container gone.
func (r *Runtime) PodOf(ctx context.Context, containerID string) (string, error) {
	rec, err := r.client.ContainerService().Get(r.ctx(ctx), containerID)
	if errdefs.IsNotFound(err) {
		return "", fmt.Errorf("get container %s: %w: %w", containerID, runtime.ErrNotFound, err)
	}
	if err != nil {
		return "", fmt.Errorf("get container %s: %w", containerID, err)
	}
	return rec.Labels[LabelPodUID], nil
}
