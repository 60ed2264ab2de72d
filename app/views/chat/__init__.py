"""The chat: the message list and input (`view`), one message with its tokens (`message`, `markdown`,
`token_popup`), the chat list and the sampling panel. May import records, data, state and views.common."""
