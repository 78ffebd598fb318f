package cphelper

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
)

// ApplyFile creates (or replaces) every object of a multi-document YAML
// manifest, as `kubectl apply -f` would for new objects. It knows the kinds
// an RBAC manifest holds: Namespace, ServiceAccount, ClusterRole,
// ClusterRoleBinding, Role and RoleBinding; any other kind is an error. It
// returns the objects in file order.
func ApplyFile(ctx context.Context, cs kubernetes.Interface, path string) ([]runtime.Object, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read manifest: %w", err)
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var objs []runtime.Object
	for i := 0; ; i++ {
		var raw runtime.RawExtension
		if err := dec.Decode(&raw); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return nil, fmt.Errorf("parse %s document %d: %w", path, i, err)
		}
		if len(bytes.TrimSpace(raw.Raw)) == 0 || string(bytes.TrimSpace(raw.Raw)) == "null" {
			continue
		}
		obj, gvk, err := scheme.Codecs.UniversalDeserializer().Decode(raw.Raw, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("decode %s document %d: %w", path, i, err)
		}
		if err := apply(ctx, cs, obj); err != nil {
			return nil, fmt.Errorf("apply %s %s document %d: %w", path, gvk.Kind, i, err)
		}
		objs = append(objs, obj)
	}
	if len(objs) == 0 {
		return nil, fmt.Errorf("apply %s: no objects", path)
	}
	return objs, nil
}

func apply(ctx context.Context, cs kubernetes.Interface, obj runtime.Object) error {
	c := metav1.CreateOptions{}
	u := metav1.UpdateOptions{}
	switch o := obj.(type) {
	case *corev1.Namespace:
		return createOrUpdate(ctx, o, cs.CoreV1().Namespaces().Create, cs.CoreV1().Namespaces().Update, c, u)
	case *corev1.ServiceAccount:
		api := cs.CoreV1().ServiceAccounts(o.Namespace)
		return createOrUpdate(ctx, o, api.Create, api.Update, c, u)
	case *rbacv1.ClusterRole:
		api := cs.RbacV1().ClusterRoles()
		return createOrUpdate(ctx, o, api.Create, api.Update, c, u)
	case *rbacv1.ClusterRoleBinding:
		api := cs.RbacV1().ClusterRoleBindings()
		return createOrUpdate(ctx, o, api.Create, api.Update, c, u)
	case *rbacv1.Role:
		api := cs.RbacV1().Roles(o.Namespace)
		return createOrUpdate(ctx, o, api.Create, api.Update, c, u)
	case *rbacv1.RoleBinding:
		api := cs.RbacV1().RoleBindings(o.Namespace)
		return createOrUpdate(ctx, o, api.Create, api.Update, c, u)
	case *appsv1.DaemonSet:
		api := cs.AppsV1().DaemonSets(o.Namespace)
		return createOrUpdate(ctx, o, api.Create, api.Update, c, u)
	default:
		return fmt.Errorf("unsupported kind %T", obj)
	}
}

func createOrUpdate[T any](ctx context.Context, obj T,
	create func(context.Context, T, metav1.CreateOptions) (T, error),
	update func(context.Context, T, metav1.UpdateOptions) (T, error),
	c metav1.CreateOptions, u metav1.UpdateOptions,
) error {
	_, err := create(ctx, obj, c)
	if apierrors.IsAlreadyExists(err) {
		_, err = update(ctx, obj, u)
	}
	return err
}
