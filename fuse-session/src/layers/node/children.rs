//! [`Children`]: a directory's children kept in memory, with listing
//! cookies that stay valid while names come and go.

/// A directory's children, for nodes that keep them in memory: names in
/// creation order, with listing cookies (for [`Node::readdir`](super::Node::readdir) and
/// [`DirFill::add`](super::DirFill::add)) that stay valid while names come and go, so a listing
/// neither skips nor repeats a name because others were added or removed.
///
/// ```
/// use fuse_session::node::Children;
///
/// let mut c = Children::new();
/// c.insert(b"b".to_vec(), 2);
/// c.insert(b"a".to_vec(), 1);
/// let first: Vec<_> = c.after(0).map(|(cookie, name, _)| (cookie, name.to_vec())).collect();
/// assert_eq!(first, [(1, b"b".to_vec()), (2, b"a".to_vec())]);
/// c.remove(b"b"); // removed while listing: "a" keeps its cookie
/// assert_eq!(c.after(1).map(|(_, n, v)| (n.to_vec(), *v)).collect::<Vec<_>>(), [(b"a".to_vec(), 1)]);
/// ```
#[derive(Clone, Debug)]
pub struct Children<T> {
    names: std::collections::BTreeMap<Vec<u8>, (u64, T)>,
    order: std::collections::BTreeMap<u64, Vec<u8>>,
    next: u64,
}

impl<T> Default for Children<T> {
    fn default() -> Self {
        Children {
            names: Default::default(),
            order: Default::default(),
            next: 0,
        }
    }
}

impl<T> Children<T> {
    /// No children.
    pub fn new() -> Self {
        Self::default()
    }

    /// The child called `name`.
    pub fn get(&self, name: &[u8]) -> Option<&T> {
        self.names.get(name).map(|(_, c)| c)
    }

    /// Whether there is a child called `name`.
    pub fn contains(&self, name: &[u8]) -> bool {
        self.names.contains_key(name)
    }

    /// Adds (or replaces) `name`; it is listed after every other child.
    /// Returns the child it replaced.
    pub fn insert(&mut self, name: Vec<u8>, child: T) -> Option<T> {
        let old = self.remove(&name);
        self.next += 1;
        self.order.insert(self.next, name.clone());
        self.names.insert(name, (self.next, child));
        old
    }

    /// Removes `name`.
    pub fn remove(&mut self, name: &[u8]) -> Option<T> {
        let (cookie, child) = self.names.remove(name)?;
        self.order.remove(&cookie);
        Some(child)
    }

    /// How many children.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// The children listed after cookie `offset` (0: all), each with its
    /// own cookie (to pass as [`DirFill::add`](super::DirFill::add)'s `next`), name and value.
    pub fn after(&self, offset: u64) -> impl Iterator<Item = (u64, &[u8], &T)> {
        self.order
            .range(offset.saturating_add(1)..)
            .filter_map(|(&cookie, name)| self.names.get(name).map(|(_, c)| (cookie, name.as_slice(), c)))
    }
}
